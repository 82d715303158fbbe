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
  /**
   * A line of progress for work that may take a while on a large database, shown on the
   * terminal (stderr) and nowhere else: a no-op with --json, when stderr is not a terminal, and
   * when a server runs the command for its admin socket. Starting one ends the one before.
   */
  progress(label: string): Progress;
}

/** What a long command shows while it works: `label: text`, one line redrawn in place. */
export interface Progress {
  /** What is being done now and how far; drawn at once, or within PROGRESS_INTERVAL_MS when the line was just drawn. */
  update(text: string): void;
  /** Clears the line (the command's output, or another progress, follows). */
  done(): void;
}

export const NO_PROGRESS: Progress = { update: () => {}, done: () => {} };

/** The line is redrawn at most this often: ten times a second. */
export const PROGRESS_INTERVAL_MS = 100;

/** The progress line of one command run: `start` is CommandContext.progress, `end` clears it before output. */
export interface ProgressLine {
  start(label: string): Progress;
  end(): void;
}

const CLEAR_LINE = '\r\x1b[K';

/**
 * The progress line on a terminal (`write` writes to stderr), or one that shows nothing when
 * there is none. A line wider than the terminal is cut, since \r returns only to the start of
 * its last row. Updates between redraws are not lost: the latest is drawn when its turn comes.
 */
export function progressLine(terminal: { write: (text: string) => void; columns?: (() => number | undefined) | undefined } | undefined): ProgressLine {
  if (!terminal) return { start: () => NO_PROGRESS, end: () => {} };
  let owner: object | undefined;
  let shown = false;
  let drawnAt = -Infinity;
  let pending: string | undefined;
  let timer: NodeJS.Timeout | undefined;
  const draw = (line: string) => {
    clearTimeout(timer);
    timer = undefined;
    pending = undefined;
    drawnAt = Date.now();
    shown = true;
    // A terminal of unknown width (a pseudo-terminal nobody sized says 0) is taken to be 80 wide.
    const width = Math.max(20, (terminal.columns?.() || 80) - 1);
    terminal.write(`${CLEAR_LINE}${line.length > width ? `${line.slice(0, width - 1)}…` : line}`);
  };
  const end = () => {
    clearTimeout(timer);
    timer = undefined;
    pending = undefined;
    owner = undefined;
    if (shown) terminal.write(CLEAR_LINE);
    shown = false;
  };
  return {
    start(label) {
      end();
      const self = {};
      owner = self;
      return {
        update(text) {
          if (owner !== self) return;
          const line = `${label}: ${text}`;
          const wait = drawnAt + PROGRESS_INTERVAL_MS - Date.now();
          if (wait <= 0) return draw(line);
          pending = line;
          timer ??= setTimeout(() => pending !== undefined && draw(pending), wait);
          timer.unref();
        },
        done() {
          if (owner === self) end();
        },
      };
    },
    end,
  };
}

/** A count for people: 12,345. */
export const count = (n: number): string => n.toLocaleString('en-US');

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
