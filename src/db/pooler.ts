/**
 * Behind a transaction-pooling PgBouncer (DATABASE_POOLER=transaction). PgBouncer in transaction
 * mode lends a PostgreSQL session to a client for one transaction (or one statement outside a
 * transaction), then to another client: nothing may outlive a transaction on a session. What
 * would, and what orgauth does instead in that mode:
 *
 * - Named prepared statements (`prepared()` in connect.ts): prepared on one session, missing on
 *   the next ("prepared statement ... does not exist", or "already exists" on a session another
 *   client prepared it on). They are sent unnamed, planned at each call. PgBouncer 1.18 cannot
 *   keep track of them; `max_prepared_statements` arrived in 1.21.
 * - statement_timeout: pg sends it as a startup parameter, which PgBouncer refuses
 *   ("unsupported startup parameter") or, listed in ignore_startup_parameters, drops. SET LOCAL
 *   would cost a statement per transaction and miss the statements outside one. So it is not
 *   sent: the operator gives orgauth's role the server-side timeout once (`alter role ... in
 *   database ... set statement_timeout`), every pooled session starts with it, and
 *   statementTimeoutProblem() checks it at start. The server still cancels a statement shortly
 *   before the client gives up (connect.ts, REQUEST_QUERY_TIMEOUT_MS).
 * - LISTEN registers a session, not a client: notifications go to whoever holds that session
 *   next, never to the listener. The LISTEN connections use DATABASE_LISTEN_URL, required in
 *   this mode (config.ts): PostgreSQL itself, or a PgBouncer database in session mode. NOTIFY
 *   (pg_notify in the revoking transaction, or the applications trigger) is sent at commit and
 *   works through the pooler.
 * - Kysely's migration lock, a session-level advisory lock: src/db/migration-lock.ts moves it
 *   into the migration transaction (in every mode).
 *
 * Nothing else keeps session state: no SET, temporary table, cursor, WITH HOLD or session
 * advisory lock; the sweeper's `for update skip locked` and every other lock live in one
 * statement or one transaction. Transaction pooling cannot be detected reliably from the client
 * (the backend pid differs between transactions only when other clients compete for the pool),
 * so the mode is a setting.
 */
import { sql } from 'kysely';
import { type DB, REQUEST_QUERY_TIMEOUT_MS, STATEMENT_TIMEOUT_MARGIN_MS } from './connect.js';

/** The server-side statement_timeout the request connections need: the one connect.ts sends when it can. */
export const SERVER_STATEMENT_TIMEOUT_MS = REQUEST_QUERY_TIMEOUT_MS - STATEMENT_TIMEOUT_MARGIN_MS;

/**
 * Reads the statement_timeout pooled sessions start with. Returns undefined when the server
 * cancels a statement before the client gives up on it (after REQUEST_QUERY_TIMEOUT_MS), else a
 * line for the operator with the statement that sets it.
 */
export async function statementTimeoutProblem(db: DB): Promise<string | undefined> {
  const { rows } = await sql<{ ms: string; role: string; database: string }>`
    select setting as ms, quote_ident(current_user) as role, quote_ident(current_database()) as database
    from pg_settings where name = 'statement_timeout'`.execute(db);
  const row = rows[0];
  const ms = Number(row?.ms ?? 0);
  if (ms > 0 && ms < REQUEST_QUERY_TIMEOUT_MS) return undefined;
  return (
    `DATABASE_POOLER=transaction: the server's statement_timeout is ${ms === 0 ? 'off' : `${ms} ms`}, so a statement this instance ` +
    `gave up on after ${REQUEST_QUERY_TIMEOUT_MS} ms may still run and commit; set it for orgauth's role: ` +
    `alter role ${row?.role ?? '<role>'} in database ${row?.database ?? '<database>'} set statement_timeout = '${SERVER_STATEMENT_TIMEOUT_MS}ms'`
  );
}
