/** The `code` of a Node.js system error (ENOENT, EEXIST, ...), or undefined for anything else. */
export function errnoCode(err: unknown): string | undefined {
  return err instanceof Error && 'code' in err && typeof err.code === 'string' ? err.code : undefined;
}

/** An error in one line for a log or a status column: its code (when the message lacks it) and message, at most `max` characters. */
export function describeError(err: unknown, max = 500): string {
  if (!(err instanceof Error)) return String(err).replace(/\s+/g, ' ').slice(0, max);
  const code = errnoCode(err) ?? '';
  const message = err.message || err.name;
  return `${code && !message.includes(code) ? `${code}: ` : ''}${message}`.replace(/\s+/g, ' ').slice(0, max);
}
