"""Where the values live: devices, device buffers (ping-pong weight sets, host scalars), staging, prediction."""
