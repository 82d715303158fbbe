/**
 * Query plans for the plan tests: the statement a function sends, captured before it runs, and
 * its plan as EXPLAIN (FORMAT JSON) gives it, read the same on PostgreSQL (a parsed value) and
 * PGlite (text).
 */
import { CompiledQuery, type Kysely } from 'kysely';
import type { DB } from '../../src/db/connect.js';
import type { Database } from '../../src/db/schema.js';

export interface PlanNode {
  'Node Type': string;
  'Relation Name'?: string;
  'Index Name'?: string;
  'Index Cond'?: string;
  Plans?: PlanNode[];
}

/** Every node of a plan, the root first. */
export const nodesOf = (plan: PlanNode): PlanNode[] => [plan, ...(plan.Plans ?? []).flatMap(nodesOf)];

export type ExplainRows = { rows: { 'QUERY PLAN': [{ Plan: PlanNode }] | string }[] };

/** The plan of an EXPLAIN (FORMAT JSON) result. */
export function planIn(result: ExplainRows): PlanNode {
  const cell = result.rows[0]!['QUERY PLAN'];
  return (typeof cell === 'string' ? (JSON.parse(cell) as [{ Plan: PlanNode }]) : cell)[0].Plan;
}

class Captured extends Error {}

/** The first statement `fn` sends through `db`, captured before it runs: nothing is executed. */
export async function firstQueryOf(db: DB, fn: (db: DB) => Promise<unknown>): Promise<CompiledQuery> {
  let compiled: CompiledQuery | undefined;
  const executor = db.getExecutor();
  const capturing = db.withPlugin({
    transformQuery: ({ node, queryId }) => {
      compiled = executor.compileQuery(node, queryId);
      throw new Captured();
    },
    transformResult: async ({ result }) => result,
  });
  await fn(capturing).catch((err: unknown) => {
    if (!(err instanceof Captured)) throw err;
  });
  if (!compiled) throw new Error('the function sent no query');
  return compiled;
}

/** The plan of a captured statement on `db` (a transaction, to plan under its SET LOCAL settings); a prepared-statement marker is dropped. */
export async function explain(db: Kysely<Database>, query: CompiledQuery): Promise<PlanNode> {
  const text = query.sql.replace(/^\/\* prepared: [a-z_]+ \*\/ /, '');
  return planIn(await db.executeQuery<ExplainRows['rows'][number]>(CompiledQuery.raw(`explain (format json) ${text}`, [...query.parameters])));
}

/** `db` with every statement recorded as it runs (and still run). */
export function recording(db: DB): { db: DB; queries: CompiledQuery[] } {
  const queries: CompiledQuery[] = [];
  const executor = db.getExecutor();
  const recorded = db.withPlugin({
    transformQuery: ({ node, queryId }) => {
      queries.push(executor.compileQuery(node, queryId));
      return node;
    },
    transformResult: async ({ result }) => result,
  });
  return { db: recorded, queries };
}
