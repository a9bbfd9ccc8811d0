"""Services the roles define as systemd units, run by systemd on hosts that have it and by
Warren's own supervisor on hosts that do not (`warren service up|down|status`)."""
