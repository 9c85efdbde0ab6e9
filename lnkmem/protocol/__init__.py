"""JSON-RPC/MCP for one session and the four tools over a memory."""
