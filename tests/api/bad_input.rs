// tests for bad_input
