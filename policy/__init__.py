"""Policy backends behind one small async interface (see ``base.py``)."""
