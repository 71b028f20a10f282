"""Emulating machines: hardware profiles and paced compute.

``profile`` is the profile format (a machine's pass curves, the pair's
acceptance, the link); ``paper`` the paper's Macs as a profile, with the
figures they come from, and ``load_profile``; ``pace`` holds a process's
forward passes to a profiled machine's time (``--pace PROFILE:MACHINE``).
"""
