"""Drivers over one capture: `factory.py` (`hooktrace run`, `hooktrace hooks`) and `script.py`
(`hooktrace exec`: a user's script, traced inside a window of steps).

These call the capture (`hooktrace.capture`); they never touch torch internals themselves.
"""
