"""Email notifications: preferences and the missed-reply ladder, the three sweeps, the sender."""
