"""Placeholder: built by its issue (see DESIGN.md)."""
