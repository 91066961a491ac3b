"""Offline, seeded text environments with legal menus (`rlid.types.Environment`)."""
