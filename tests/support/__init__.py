"""Helpers shared by the test suites (never imported by cnibox itself)."""
