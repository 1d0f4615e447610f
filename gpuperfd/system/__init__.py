"""How the daemon lives on a host: systemd install/uninstall, sd_notify, logging."""
