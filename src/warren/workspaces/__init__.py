"""The workspace layer on the local node."""
