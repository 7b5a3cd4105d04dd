// tests for purchase
