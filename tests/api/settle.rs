// tests for settle
