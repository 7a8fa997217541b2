"""Batching policies and the controller that applies them."""
