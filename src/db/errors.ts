/** Recognizing database failures the same way on PostgreSQL (pg) and PGlite. */

function sqlState(err: unknown): string | undefined {
  if (typeof err === 'object' && err !== null && 'code' in err && typeof err.code === 'string') return err.code;
  return undefined;
}

/** 23505: a unique constraint (optionally the named one) rejected the row. */
export function isUniqueViolation(err: unknown, constraint?: string): boolean {
  if (sqlState(err) !== '23505') return false;
  if (constraint === undefined) return true;
  return typeof err === 'object' && err !== null && 'constraint' in err && err.constraint === constraint;
}

/** 23514: a check constraint rejected the row. */
export function isCheckViolation(err: unknown): boolean {
  return sqlState(err) === '23514';
}

/** 23503: a foreign key names a row that does not exist. */
export function isForeignKeyViolation(err: unknown): boolean {
  return sqlState(err) === '23503';
}

const UNAVAILABLE_NODE_CODES = new Set(['ECONNREFUSED', 'ECONNRESET', 'ETIMEDOUT', 'EPIPE', 'ENOTFOUND', 'EHOSTUNREACH', 'EAI_AGAIN']);

/**
 * The database cannot be reached (as opposed to refusing a query): connection refused or lost,
 * the server shutting down or starting up (SQLSTATE class 08, 57P01-57P03), the pool timing out,
 * a query left without an answer (pg's query_timeout: a hung server or a network partition) or
 * cancelled by the server for taking too long (57014: statement_timeout, a blocked or overloaded
 * database).
 */
export function isDatabaseUnavailable(err: unknown): boolean {
  const code = sqlState(err);
  if (code !== undefined) {
    if (UNAVAILABLE_NODE_CODES.has(code) || code.startsWith('08') || ['57014', '57P01', '57P02', '57P03', '53300'].includes(code)) return true;
  }
  if (err instanceof AggregateError) return err.errors.some(isDatabaseUnavailable);
  if (!(err instanceof Error)) return false;
  return (
    /timeout exceeded when trying to connect|Connection terminated|connection terminated|Client has encountered a connection error|Query read timeout|PGlite is closed|driver has already been destroyed/i.test(
      err.message,
    ) || (err.cause !== undefined && err.cause !== err && isDatabaseUnavailable(err.cause))
  );
}

/** 40001 serialization failure, 40P01 deadlock: the transaction lost a race and may be retried. */
export function isTransactionConflict(err: unknown): boolean {
  const code = sqlState(err);
  return code === '40001' || code === '40P01';
}

/** Class 22 (data exception: bad value for a type) and 23514 (check constraint): the input, not the server. */
export function isBadValue(err: unknown): boolean {
  const code = sqlState(err);
  return code !== undefined && (code.startsWith('22') || code === '23514');
}
