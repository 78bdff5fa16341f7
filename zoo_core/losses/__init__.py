"""Losses shared by several families (one copy each, named for what they compute)."""
