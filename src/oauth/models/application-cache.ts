/**
 * Applications by client_id, cached for client authentication: the token, revocation and
 * introspection endpoints would otherwise read the same row on every request.
 *
 * A change must take effect at once on every instance (a rotated secret, a disabled
 * application), so an entry is dropped three ways: by this process right after it changes the
 * application (forget), by the database's NOTIFY on `orgauth_applications` that a trigger sends
 * for every update or delete of an application (migration 0002), and by age: an entry older than
 * MAX_AGE_MS is read again, which bounds staleness while the LISTEN connection is down.
 */
import type { FastifyBaseLogger } from 'fastify';
import type { DB, Listen } from '../../db/connect.js';
import type { Application } from '../../db/schema.js';
import { findApplicationByClientId } from './applications.js';

export const APPLICATION_CHANNEL = 'orgauth_applications';
const MAX_AGE_MS = 500;
/** Client ids are checked against CLIENT_ID_PATTERN before they get here, and misses are not kept. */
const MAX_ENTRIES = 10_000;

export type FindApplication = (clientId: string) => Promise<Application | undefined>;

export class ApplicationCache {
  private readonly entries = new Map<string, { application: Application; loadedAt: number }>();
  private readonly loading = new Map<string, Promise<Application | undefined>>();
  /** Bumped by every invalidation, so a read that started before one is not stored after it. */
  private epoch = 0;
  private unlisten: (() => Promise<void>) | undefined;

  constructor(
    private readonly db: DB,
    private readonly options: { listen?: Listen | undefined; logger?: FastifyBaseLogger | undefined } = {},
  ) {}

  async start(): Promise<void> {
    if (this.options.listen) {
      // Notifications sent while the connection was down are lost: start over when it is back.
      this.unlisten = await this.options.listen(APPLICATION_CHANNEL, (clientId) => this.forget(clientId), () => this.clear());
    }
  }

  async stop(): Promise<void> {
    await this.unlisten?.();
    this.clear();
  }

  /** The application, from memory when the entry is fresh, otherwise from the database. */
  find: FindApplication = (clientId) => {
    const entry = this.entries.get(clientId);
    if (entry && performance.now() - entry.loadedAt < MAX_AGE_MS) return Promise.resolve(entry.application);
    let pending = this.loading.get(clientId);
    if (!pending) {
      const loading = this.load(clientId).finally(() => {
        if (this.loading.get(clientId) === loading) this.loading.delete(clientId);
      });
      this.loading.set(clientId, loading);
      pending = loading;
    }
    return pending;
  };

  forget(clientId: string): void {
    this.epoch++;
    this.entries.delete(clientId);
    this.loading.delete(clientId);
  }

  clear(): void {
    this.epoch++;
    this.entries.clear();
    this.loading.clear();
  }

  private async load(clientId: string): Promise<Application | undefined> {
    const epoch = this.epoch;
    const loadedAt = performance.now();
    const application = await findApplicationByClientId(this.db, clientId);
    if (application && epoch === this.epoch) {
      this.entries.delete(clientId);
      if (this.entries.size >= MAX_ENTRIES) this.entries.delete(this.entries.keys().next().value!);
      this.entries.set(clientId, { application, loadedAt });
    }
    return application;
  }
}
