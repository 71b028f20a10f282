"""What every process of either role runs on: its compute thread, its way out, its memory readings."""
