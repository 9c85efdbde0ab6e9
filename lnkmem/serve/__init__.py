"""Transports of sessions: stdio, serve-many's socket, Bound and team bindings."""
