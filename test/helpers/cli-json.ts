/**
 * The CLI tests' readers of `--json` output: `json` runs a command that must succeed and returns
 * its one object; `jsonError` runs one that must fail and returns its error object from stderr.
 */
import { expect } from 'vitest';

type Outcome = { code: number; stdout: string; stderr: string };

export function jsonCommands(cli: (...argv: string[]) => Promise<Outcome>) {
  return {
    async json(...argv: string[]): Promise<Record<string, any>> {
      const result = await cli(...argv, '--json');
      expect(result, result.stderr).toMatchObject({ code: 0, stderr: '' });
      expect(result.stdout.trim().split('\n')).toHaveLength(1);
      return JSON.parse(result.stdout) as Record<string, any>;
    },
    async jsonError(...argv: string[]): Promise<{ error: string; error_description: string }> {
      const result = await cli(...argv, '--json');
      expect(result, result.stdout).toMatchObject({ code: 1, stdout: '' });
      return JSON.parse(result.stderr) as { error: string; error_description: string };
    },
  };
}
