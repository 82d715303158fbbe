/**
 * Runs in every test file's worker before the file (vitest setupFiles). Files share a worker
 * (isolate: false in vitest.config.ts), so what one file changes of the process is put back.
 */
import { afterAll, beforeEach, vi } from 'vitest';
import { usePasswordHashing } from '../src/accounts/passwords.js';

// argon2 at test cost where its cost is not the subject (test/accounts/password-hashing.test.ts
// checks the standard parameters in a process of its own). A CLI run in-process applies its
// env's PASSWORD_HASHING, so it is set again before each test.
usePasswordHashing('weak-for-tests');
beforeEach(() => usePasswordHashing('weak-for-tests'));

afterAll(() => {
  vi.useRealTimers();
  vi.restoreAllMocks();
  vi.unstubAllEnvs();
  vi.unstubAllGlobals();
});
