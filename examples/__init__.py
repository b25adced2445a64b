"""Examples of using synnefo-ganeti; each is a runnable file (see docs/cloud-api.md)."""
