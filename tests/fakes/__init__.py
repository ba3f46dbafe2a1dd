"""Test-only fakes (named `Fake...`): never imported by the package itself."""
