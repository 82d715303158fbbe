/**
 * The cost of password hashes: production's argon2id parameters, checked in a process of its
 * own (this suite's workers hash at test cost: test/setup.ts), and the cheap ones only where
 * PASSWORD_HASHING asks for them.
 */
import { execFile } from 'node:child_process';
import { promisify } from 'node:util';
import { describe, expect, it } from 'vitest';
import { hashPassword, passwordHashing, usePasswordHashing, verifyPassword } from '../../src/accounts/passwords.js';

const run = promisify(execFile);

/** What a fresh process (not a test worker) hashes with, and whether it verifies. */
async function hashInFreshProcess(env: Record<string, string>): Promise<{ kind: string; hash: string; verifies: boolean }> {
  const script = `
    import { hashPassword, passwordHashing, usePasswordHashing, verifyPassword } from './src/accounts/passwords.ts';
    import { loadConfig } from './src/config.ts';
    if (process.argv[1] === 'apply') usePasswordHashing(loadConfig().passwordHashing);
    const hash = await hashPassword('correct horse battery staple');
    console.log(JSON.stringify({ kind: passwordHashing(), hash, verifies: await verifyPassword(hash, 'correct horse battery staple') }));
  `;
  const { stdout } = await run(process.execPath, ['--import', 'tsx', '--input-type=module', '-e', script, 'apply'], {
    cwd: new URL('../..', import.meta.url).pathname,
    env: { PATH: process.env.PATH ?? '', SECRET_KEY: 'x'.repeat(32), DATABASE_URL: 'postgres://localhost/unused', ...env },
  });
  return JSON.parse(stdout.trim()) as { kind: string; hash: string; verifies: boolean };
}

describe('password hashing cost', () => {
  it('hashes with argon2id at m=64 MiB, t=3, p=4 by default (a process without PASSWORD_HASHING)', async () => {
    const result = await hashInFreshProcess({});
    expect(result.kind).toBe('standard');
    expect(result.hash).toMatch(/^\$argon2id\$v=19\$m=65536,t=3,p=4\$/);
    expect(result.verifies).toBe(true);
  });

  it('production refuses the test cost before anything is hashed', async () => {
    const err = await hashInFreshProcess({ PASSWORD_HASHING: 'weak-for-tests', NODE_ENV: 'production' }).catch((e: unknown) => e as { stderr: string });
    expect(String((err as { stderr: string }).stderr)).toContain('PASSWORD_HASHING: weak-for-tests is for test suites only and is refused in production');
  });

  it('weak-for-tests hashes at m=1 MiB, t=1, p=1, and hashes of either cost verify under the other', async () => {
    const before = passwordHashing();
    try {
      usePasswordHashing('standard');
      const strong = await hashPassword('a long enough password');
      expect(strong).toMatch(/^\$argon2id\$v=19\$m=65536,t=3,p=4\$/);
      usePasswordHashing('weak-for-tests');
      const weak = await hashPassword('a long enough password');
      expect(weak).toMatch(/^\$argon2id\$v=19\$m=1024,t=1,p=1\$/);
      expect(await verifyPassword(strong, 'a long enough password')).toBe(true);
      expect(await verifyPassword(weak, 'a long enough password')).toBe(true);
      expect(await verifyPassword(weak, 'another password entirely')).toBe(false);
      usePasswordHashing('standard');
      expect(await verifyPassword(weak, 'a long enough password')).toBe(true);
    } finally {
      usePasswordHashing(before);
    }
  });
});
