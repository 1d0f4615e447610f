"""Where a probe runs for real: the parent's side of a probe child process (start it by module
name, talk to it, end it), the executor session that keeps one warm per sweep, and the children
started before their GPU qualifies (standby.py, issue 50)."""
