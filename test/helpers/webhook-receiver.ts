/**
 * A real webhook receiver for the tests: a node:http server on 127.0.0.1 that verifies every
 * request with the Standard Webhooks reference library (as a customer's receiver would), records
 * it, and answers as the test says: a status and body, a redirect, never (a hanging receiver), or
 * when the test lets it (a slow receiver: the answer is a promise the test settles).
 * It can go down (connections refused) and come back on the same port, as a receiver's outage.
 */
import { once } from 'node:events';
import http from 'node:http';
import { type AddressInfo, createServer, type Server, type Socket } from 'node:net';
import { Webhook } from 'standardwebhooks';

/** The timers as they were at load: a test that fakes the clock (vi.useFakeTimers) still gets real timeouts here. */
const realSetTimeout = globalThis.setTimeout;
const realClearTimeout = globalThis.clearTimeout;

export interface ReceivedWebhook {
  path: string;
  method: string;
  headers: http.IncomingHttpHeaders;
  id: string;
  timestamp: string;
  signature: string;
  body: string;
  /** The secrets (of `receiver.secrets`) that verify the request; empty when none does. */
  verifiedWith: string[];
  at: number;
}

/**
 * What to answer: a status (and body, headers); 'hang' keeps the request open until stop();
 * 'reset' drops the connection without an answer, as a receiver that crashes on every request.
 */
export type Answer = { status: number; body?: string; headers?: Record<string, string> } | 'hang' | 'reset';

export class WebhookReceiver {
  readonly received: ReceivedWebhook[] = [];
  /** The secrets each request is verified with. */
  secrets: string[] = [];
  /** Decides each answer, at once or when its promise settles; 204 by default. */
  answer: (request: ReceivedWebhook) => Answer | Promise<Answer> = () => ({ status: 204 });
  private server: http.Server | undefined;
  private readonly sockets = new Set<Socket>();
  /** Told of each request as it is recorded (waitFor). */
  private readonly arrivals = new Set<() => void>();

  private constructor(public port: number) {}

  static async start(): Promise<WebhookReceiver> {
    const receiver = new WebhookReceiver(0);
    await receiver.listen();
    return receiver;
  }

  url(path = '/hook'): string {
    return `http://127.0.0.1:${this.port}${path}`;
  }

  /** Listens (again) on the same port; the first time on a free one. */
  async listen(): Promise<void> {
    const server = http.createServer((req, res) => void this.handle(req, res));
    server.on('connection', (socket: Socket) => {
      this.sockets.add(socket);
      socket.once('close', () => this.sockets.delete(socket));
    });
    server.listen(this.port, '127.0.0.1');
    await once(server, 'listening');
    this.port = (server.address() as AddressInfo).port;
    this.server = server;
  }

  /** Goes down: the port refuses connections until listen() again; hanging requests are cut. */
  async stop(): Promise<void> {
    const server = this.server;
    this.server = undefined;
    if (!server) return;
    const closed = new Promise<void>((resolve) => server.close(() => resolve()));
    for (const socket of this.sockets) socket.destroy();
    await closed;
  }

  /** The requests carrying webhook-id `id`, in order. */
  withId(id: string): ReceivedWebhook[] {
    return this.received.filter((r) => r.id === id);
  }

  /** Waits for a request that `match` accepts (one already received, or the next that arrives) and returns it. */
  async waitFor(match: (r: ReceivedWebhook) => boolean, timeout = 15_000): Promise<ReceivedWebhook> {
    const found = this.received.find(match);
    if (found) return found;
    let arrived!: () => void;
    let timer: NodeJS.Timeout | undefined;
    try {
      return await new Promise<ReceivedWebhook>((resolve, reject) => {
        arrived = () => {
          const request = this.received.find(match);
          if (request) resolve(request);
        };
        this.arrivals.add(arrived);
        timer = realSetTimeout(() => reject(new Error(`no matching webhook request arrived within ${timeout} ms (${this.received.length} received)`)), timeout);
      });
    } finally {
      this.arrivals.delete(arrived);
      realClearTimeout(timer);
    }
  }

  private async handle(req: http.IncomingMessage, res: http.ServerResponse): Promise<void> {
    const chunks: Buffer[] = [];
    for await (const chunk of req) chunks.push(chunk as Buffer);
    const body = Buffer.concat(chunks).toString('utf8');
    const header = (name: string) => String(req.headers[name] ?? '');
    const headers = { 'webhook-id': header('webhook-id'), 'webhook-timestamp': header('webhook-timestamp'), 'webhook-signature': header('webhook-signature') };
    const verifiedWith = this.secrets.filter((secret) => {
      try {
        new Webhook(secret).verify(body, headers);
        return true;
      } catch {
        return false;
      }
    });
    const received: ReceivedWebhook = {
      path: req.url ?? '',
      method: req.method ?? '',
      headers: req.headers,
      id: headers['webhook-id'],
      timestamp: headers['webhook-timestamp'],
      signature: headers['webhook-signature'],
      body,
      verifiedWith,
      at: Date.now(),
    };
    this.received.push(received);
    for (const arrived of [...this.arrivals]) arrived();
    const answer = await this.answer(received);
    if (answer === 'hang') return;
    if (answer === 'reset') {
      req.socket.destroy();
      return;
    }
    res.writeHead(answer.status, { 'content-type': 'text/plain', ...answer.headers }).end(answer.body ?? '');
  }
}

/**
 * A TCP port on 127.0.0.1 (and the same port on ::1 when it is free) that counts connections and
 * answers none: proof that nothing connected to it.
 */
export async function connectionTrap(): Promise<{ port: number; connections: () => number; close(): Promise<void> }> {
  let count = 0;
  const sockets = new Set<Socket>();
  const open = async (host: string, port: number): Promise<Server | undefined> => {
    const server = createServer((socket) => {
      count++;
      sockets.add(socket);
      socket.destroy();
    });
    server.listen(port, host);
    try {
      await once(server, 'listening');
      return server;
    } catch {
      return undefined;
    }
  };
  const v4 = (await open('127.0.0.1', 0))!;
  const port = (v4.address() as AddressInfo).port;
  const servers = [v4, await open('::1', port)].filter((s): s is Server => s !== undefined);
  return {
    port,
    connections: () => count,
    close: async () => {
      for (const socket of sockets) socket.destroy();
      await Promise.all(servers.map((server) => new Promise<void>((resolve) => server.close(() => resolve()))));
    },
  };
}
