/** What an `orgauth` command is, and the helpers the command groups share: reading options, listing a page. */
import type { ParseArgsConfig } from 'node:util';
import { organizationIdSchema } from '../accounts/organizations.js';
import { listPage } from '../api/pagination.js';
import type { Config } from '../config.js';
import type { DB } from '../db/connect.js';
import { InvalidRequestError, NotFoundError } from '../errors.js';
import { parseInput } from '../lib/validate.js';
import { isDeveloperApplication } from '../db/schema.js';
import { findApplicationByClientId } from '../oauth/models/applications.js';

export type Options = NonNullable<ParseArgsConfig['options']>;
export type Values = Record<string, string | boolean | (string | boolean)[] | undefined>;

/** What a command runs with: the database, and the configuration of whoever opened it (this process, or the server). */
export interface CommandContext {
  db: DB;
  config: Config;
  /** Migrations applied while opening the database. */
  applied: string[];
}

export interface Command {
  usage: string;
  summary: string;
  options: Options;
  run(ctx: CommandContext, values: Values): Promise<{ json: object; text: string }>;
}

export class UsageError extends InvalidRequestError {}

export function required(values: Values, name: string): string {
  const value = values[name];
  if (typeof value !== 'string' || value === '') throw new UsageError(`--${name} is required`);
  return value;
}

export function optionalString(values: Values, name: string): string | undefined {
  const value = values[name];
  return typeof value === 'string' ? value : undefined;
}

/** A yes|no option: true, false, or undefined when not given. */
export function yesNo(values: Values, name: string): boolean | undefined {
  const value = optionalString(values, name);
  if (value === undefined) return undefined;
  if (value !== 'yes' && value !== 'no') throw new UsageError(`--${name} must be yes or no`);
  return value === 'yes';
}

/** A repeatable option (`multiple: true`): every value given, in order. */
export function repeated(values: Values, name: string): string[] {
  const value = values[name];
  return Array.isArray(value) ? value.filter((v) => typeof v === 'string') : [];
}

export function orgId(values: Values): number {
  return parseInput(organizationIdSchema, required(values, 'org'));
}

export async function applicationByClientId(db: DB, clientId: string) {
  const application = await findApplicationByClientId(db, clientId);
  // A deleted one is a tombstone (its grants' record): as missing as an unknown one.
  if (!application || !isDeveloperApplication(application) || application.deleted_at !== null) throw new NotFoundError(`no application with client_id ${clientId}`);
  return application;
}

// Lists: a page at a time, like the API (keyset pagination; --cursor is the previous page's next_cursor).
export const PAGE_OPTIONS: Options = { limit: { type: 'string' }, cursor: { type: 'string' } };
export const PAGE_USAGE = '[--limit N] [--cursor C]';
const DEFAULT_PAGE = 100;
const MAX_PAGE = 1000;

function pageLimit(values: Values): number {
  const raw = optionalString(values, 'limit');
  if (raw === undefined) return DEFAULT_PAGE;
  const n = /^[1-9][0-9]{0,3}$/.test(raw) ? Number(raw) : NaN;
  if (!(n <= MAX_PAGE)) throw new UsageError(`--limit must be a whole number from 1 to ${MAX_PAGE}`);
  return n;
}

/** One page, shaped as the API answers it, with a text table for people. */
export async function listed<R, T extends object>(
  values: Values,
  fetch: (limit: number) => Promise<R[]>,
  keyOf: (row: R) => number,
  out: (row: R) => T,
  columns: [header: string, cell: (row: T) => string][],
): Promise<{ json: object; text: string }> {
  const result = await listPage(pageLimit(values), fetch, keyOf, out);
  const lines = [table(columns.map(([h]) => h), result.data.map((row) => columns.map(([, cell]) => cell(row))))];
  if (result.next_cursor) lines.push(`more: --cursor ${result.next_cursor}`);
  return { json: result, text: result.data.length === 0 ? '(none)' : lines.join('\n') };
}

export function table(headers: string[], rows: string[][]): string {
  const widths = headers.map((h, i) => Math.max(h.length, ...rows.map((r) => r[i]!.length)));
  return [headers, ...rows].map((r) => r.map((cell, i) => cell.padEnd(widths[i]!)).join('  ').trimEnd()).join('\n');
}
