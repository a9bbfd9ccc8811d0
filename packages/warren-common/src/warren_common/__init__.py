"""What Warren's daemons and services share, so each concern is written once."""
