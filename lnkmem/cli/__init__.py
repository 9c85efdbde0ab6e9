"""The `lnk-lnkmem` program: its subcommands for Link and for people."""
