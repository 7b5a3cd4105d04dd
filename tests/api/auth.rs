// tests for auth
