"""The operators' records: dispatchers' reports, the audit log, incidents, maintenance runs."""
