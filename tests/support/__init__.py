"""Helpers shared by the test tiers (imported as ``tests.support.<module>``)."""
