"""Sandboxed execution of untrusted code (bubblewrap locally, executor servers in sandbox pods)."""
