/** The `code` of a Node.js system error (ENOENT, EEXIST, ...), or undefined for anything else. */
export function errnoCode(err: unknown): string | undefined {
  return err instanceof Error && 'code' in err && typeof err.code === 'string' ? err.code : undefined;
}
