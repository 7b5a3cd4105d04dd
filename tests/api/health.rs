// tests for health
