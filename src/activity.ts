/**
 * What happens in each organization, per UTC day: sign-ins, consents, tokens by grant type, API
 * answers by class and refused tokens. Counted in memory where it happens (one Map increment, no
 * query on the request's path) and added to activity_daily every ACTIVITY_FLUSH_INTERVAL seconds
 * and when the app closes, by every instance: the rows are sums, so instances add to the same
 * ones. The Overview and GET /api/v1/:org/activity read those rows only — at most a dozen
 * metrics × the days asked for — so they cost the same for an organization with a million grants
 * as for an empty one.
 *
 * The map is bounded: at MAX_KEYS keys (an organization × metric × day each) it is written at
 * once, and while a write is under way at most as many again are kept; beyond that new keys are
 * dropped, logged once per flush. Counts of organizations that do not exist (an API path names
 * any id) are dropped by the write's join.
 */
import type { FastifyBaseLogger } from 'fastify';
import { sql } from 'kysely';
import type { DB } from './db/connect.js';

/** Every metric, in the order charts and the API list them. */
export const ACTIVITY_METRICS = [
  'sign_ins',
  'consents',
  'tokens_authorization_code',
  'tokens_refresh_token',
  'tokens_client_credentials',
  'tokens_device_code',
  'tokens_dashboard',
  'tokens_cli',
  'api_2xx',
  'api_4xx',
  'api_5xx',
  'api_refused',
] as const;
export type ActivityMetric = (typeof ACTIVITY_METRICS)[number];

/** The metric of a token issued with `grantType` (the token endpoint's, or 'dashboard' / 'cli'). */
export function tokenMetric(grantType: string): ActivityMetric | undefined {
  const name = `tokens_${grantType === 'urn:ietf:params:oauth:grant-type:device_code' ? 'device_code' : grantType}`;
  return (ACTIVITY_METRICS as readonly string[]).includes(name) ? (name as ActivityMetric) : undefined;
}

/** The UTC day of `at`, as 'YYYY-MM-DD'. */
export const utcDay = (at: Date = new Date()): string => at.toISOString().slice(0, 10);

const DAY_MS = 86_400_000;
/** Today's, and the milliseconds it spans: count() asks on every token, formatting a date each time cost 1.6 µs. */
let today = { day: '', from: 0, to: 0 };

/** utcDay() of now, formatted once a day. */
function utcToday(): string {
  const now = Date.now();
  if (now < today.from || now >= today.to) {
    const from = now - (now % DAY_MS);
    today = { day: utcDay(new Date(from)), from, to: from + DAY_MS };
  }
  return today.day;
}

export interface ActivityCount {
  organizationId: number;
  metric: ActivityMetric;
  day: string;
  count: number;
}

/**
 * Adds `counts` to activity_daily in one statement, in key order (two instances adding to the
 * same rows then lock them in the same order). Counts of organizations that no longer exist, or
 * never did, are dropped.
 */
export async function addActivity(db: DB, counts: readonly ActivityCount[]): Promise<void> {
  if (counts.length === 0) return;
  const sorted = [...counts].sort((a, b) => a.organizationId - b.organizationId || (a.metric < b.metric ? -1 : a.metric > b.metric ? 1 : 0) || (a.day < b.day ? -1 : a.day > b.day ? 1 : 0));
  await sql`insert into activity_daily (organization_id, metric, day, count)
    select a.organization_id, a.metric, a.day, a.count
    from unnest(${sorted.map((c) => c.organizationId)}::bigint[], ${sorted.map((c) => c.metric)}::text[],
                ${sorted.map((c) => c.day)}::date[], ${sorted.map((c) => c.count)}::bigint[])
         with ordinality as a (organization_id, metric, day, count, n)
    join organizations o on o.id = a.organization_id
    order by a.n
    on conflict (organization_id, metric, day) do update set count = activity_daily.count + excluded.count`.execute(db);
}

const MAX_KEYS = 20_000;

export class ActivityCounter {
  private counts = new Map<string, ActivityCount>();
  private timer: NodeJS.Timeout | undefined;
  private flushing: Promise<void> | undefined;
  /** A write asked for because the map is full, not yet started: one, however many counts arrive meanwhile. */
  private flushAsked = false;
  private dropped = 0;

  constructor(
    private readonly db: DB,
    private readonly options: { intervalSeconds: number; logger: Pick<FastifyBaseLogger, 'warn' | 'error'> },
  ) {}

  /** Counts `n` of `metric` for the organization, today (UTC). */
  count(organizationId: number, metric: ActivityMetric, n = 1): void {
    if (!Number.isSafeInteger(organizationId) || organizationId <= 0 || n <= 0) return;
    const day = utcToday();
    const key = `${organizationId} ${metric} ${day}`;
    const entry = this.counts.get(key);
    if (entry) {
      entry.count += n;
      return;
    }
    if (this.counts.size >= 2 * MAX_KEYS) {
      this.dropped += n;
      return;
    }
    this.counts.set(key, { organizationId, metric, day, count: n });
    if (this.counts.size >= MAX_KEYS && !this.flushAsked) {
      this.flushAsked = true;
      void this.flush().finally(() => {
        this.flushAsked = false;
      });
    }
  }

  start(): void {
    this.timer = setInterval(() => void this.flush(), this.options.intervalSeconds * 1000);
    this.timer.unref();
  }

  /** Stops the timer and writes what is counted. */
  async stop(): Promise<void> {
    clearInterval(this.timer);
    this.timer = undefined;
    await this.flush();
  }

  /**
   * Writes what is counted so far (and waits for a write already under way). A failed write
   * keeps its counts for the next one.
   */
  async flush(): Promise<void> {
    while (this.flushing) await this.flushing;
    if (this.counts.size === 0) return;
    const batch = this.counts;
    this.counts = new Map();
    if (this.dropped > 0) {
      this.options.logger.warn({ dropped: this.dropped }, 'activity counts dropped: too many distinct organizations between two writes');
      this.dropped = 0;
    }
    this.flushing = addActivity(this.db, [...batch.values()])
      .catch((err: unknown) => {
        this.options.logger.error({ err }, 'could not write activity counts; keeping them for the next write');
        for (const [key, entry] of batch) {
          const now = this.counts.get(key);
          if (now) now.count += entry.count;
          else if (this.counts.size < 2 * MAX_KEYS) this.counts.set(key, entry);
          else this.dropped += entry.count;
        }
      })
      .finally(() => {
        this.flushing = undefined;
      });
    await this.flushing;
  }
}

/** One organization's counts per day over [from, to] (UTC days, inclusive), every day and metric present, zeros included. */
export interface ActivitySeries {
  from: string;
  to: string;
  days: { day: string; counts: Record<ActivityMetric, number> }[];
  totals: Record<ActivityMetric, number>;
}

const zeros = (): Record<ActivityMetric, number> => Object.fromEntries(ACTIVITY_METRICS.map((m) => [m, 0])) as Record<ActivityMetric, number>;

/** The days from `from` to `to`, inclusive, as 'YYYY-MM-DD'. */
export function daysBetween(from: string, to: string): string[] {
  const out: string[] = [];
  for (let t = Date.parse(`${from}T00:00:00Z`); t <= Date.parse(`${to}T00:00:00Z`); t += 86_400_000) out.push(utcDay(new Date(t)));
  return out;
}

export async function readActivity(db: DB, organizationId: number, from: string, to: string): Promise<ActivitySeries> {
  const rows = await db
    .selectFrom('activity_daily')
    .select(['metric', 'day', 'count'])
    .where('organization_id', '=', organizationId)
    .where('day', '>=', from)
    .where('day', '<=', to)
    .execute();
  const byDay = new Map(daysBetween(from, to).map((day) => [day, zeros()]));
  const totals = zeros();
  for (const row of rows) {
    const counts = byDay.get(row.day);
    if (!counts || !(row.metric in totals)) continue;
    counts[row.metric as ActivityMetric] += Number(row.count);
    totals[row.metric as ActivityMetric] += Number(row.count);
  }
  return { from, to, days: [...byDay].map(([day, counts]) => ({ day, counts })), totals };
}

/** Which of `metrics` the organization has ever counted (the first-run checklist: a first token, a first API call). */
export async function everCounted(db: DB, organizationId: number, metrics: readonly ActivityMetric[]): Promise<Set<ActivityMetric>> {
  const rows = await db
    .selectFrom('activity_daily')
    .select('metric')
    .distinct()
    .where('organization_id', '=', organizationId)
    .where('metric', 'in', metrics)
    .execute();
  return new Set(rows.map((r) => r.metric as ActivityMetric));
}
