"""Go standard-library behaviour that upstream's Go programs show their users."""
