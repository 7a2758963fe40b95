"""The host side: install and status, sysctls, the socket listener and its supervisor, kernel probes."""
