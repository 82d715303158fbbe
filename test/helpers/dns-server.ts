/**
 * A real DNS server for the tests (dns2, pure JavaScript), on one ephemeral port of 127.0.0.1 over
 * UDP and TCP, answering TXT questions from an in-memory map. It stands in for an organization's
 * authoritative server when orgauth checks `_orgauth-challenge.<domain>`: orgauth resolves through
 * node's c-ares resolver pointed at `address` (DNS_SERVERS), so the test exercises the real wire
 * format, the real NXDOMAIN / NODATA distinction and the real TCP fallback for large answers.
 *
 * Answers:
 * - a name set with setTxt(name, values): NOERROR, one TXT record per value (TXT questions);
 *   NOERROR with no answer for other types (NODATA, node's ENODATA), as a real zone would;
 * - setTxt(name, []): the name exists but has no TXT record, NOERROR and no answer (ENODATA);
 * - a name set with setAddresses(name, addresses): its A and AAAA records (IPv6 in the full or
 *   `::` form, not with an embedded dotted quad), for tests of what a name resolves to (webhook
 *   URLs through DNS_SERVERS); NODATA for the family it has none of;
 * - any other name: NXDOMAIN (node's ENOTFOUND).
 */
import { once } from 'node:events';
import { isIP, type Socket } from 'node:net';
import dns2, { type DnsHandler } from 'dns2';

const { Packet } = dns2;

export interface TestDnsServer {
  /** "127.0.0.1:PORT", the form node's Resolver#setServers and orgauth's DNS_SERVERS take. UDP and TCP share the port. */
  address: string;
  port: number;
  /** Replaces the TXT records of `name` (case-insensitive, trailing dot optional); each value is one record. */
  setTxt(name: string, values: string[]): void;
  /** Replaces the A and AAAA records of `name` with `addresses` (IPv4 and IPv6 literals). */
  setAddresses(name: string, addresses: string[]): void;
  /** Forgets `name`: it answers NXDOMAIN again. */
  clear(name: string): void;
  /** The names asked about so far, in order, lower-cased, whatever the type (TXT, A, ...). */
  queries(): string[];
  close(): Promise<void>;
}

/** RFC 1035 §4.1.1 response codes (dns2 has them as Packet.RCODE, which its types leave out). */
const RCODE = { FORMERR: 1, NXDOMAIN: 3 } as const;

/** DNS names compare case-insensitively (RFC 4343); a trailing dot is the same name. */
const canonical = (name: string): string => name.toLowerCase().replace(/\.$/, '');

/**
 * A TXT record is a list of character-strings of at most 255 bytes each (RFC 1035 §3.3.14); a
 * longer value is split, and the resolver hands the pieces back as one record's chunks. dns2
 * writes each piece's length in one byte without checking, so the split is ours, between code
 * points so that no piece ends inside a UTF-8 sequence.
 */
function characterStrings(value: string): string[] {
  const out: string[] = [];
  let piece = '';
  let bytes = 0;
  for (const char of value) {
    const size = Buffer.byteLength(char, 'utf8');
    if (bytes + size > 255) {
      out.push(piece);
      piece = '';
      bytes = 0;
    }
    piece += char;
    bytes += size;
  }
  out.push(piece);
  return out;
}

export async function startDnsServer(): Promise<TestDnsServer> {
  const records = new Map<string, string[]>();
  const addressRecords = new Map<string, string[]>();
  const asked: string[] = [];

  const handle: DnsHandler = (request, send) => {
    const response = Packet.createResponseFromRequest(request);
    // We are the authority for every name we are asked about (no recursion, no referrals).
    response.header.aa = 1;
    const [question] = request.questions;
    if (question) {
      const name = canonical(question.name);
      asked.push(name);
      const values = records.get(name);
      const addresses = addressRecords.get(name);
      if (addresses !== undefined && (question.type === Packet.TYPE.A || question.type === Packet.TYPE.AAAA)) {
        const wanted = question.type === Packet.TYPE.A ? 4 : 6;
        for (const address of addresses.filter((a) => isIP(a) === wanted)) {
          response.answers.push(Packet.createResourceFromQuestion(question, { type: question.type, class: Packet.CLASS.IN, ttl: 60, address }));
        }
      } else if (values === undefined && addresses === undefined) response.header.rcode = RCODE.NXDOMAIN;
      else if (values === undefined) {
        // The name has addresses only: NODATA for anything else.
      } else if (question.type === Packet.TYPE.TXT || question.type === Packet.TYPE.ANY) {
        for (const value of values) {
          response.answers.push(
            Packet.createResourceFromQuestion(question, { type: Packet.TYPE.TXT, class: Packet.CLASS.IN, ttl: 60, data: characterStrings(value) }),
          );
        }
      }
    } else {
      response.header.rcode = RCODE.FORMERR;
    }
    // A reply the socket cannot send (the client went away) is the client's problem, not the test's.
    send(response).catch(() => {});
  };

  // node's resolver retries over TCP on the same port when a UDP answer comes back truncated
  // (more than 512 bytes, e.g. many records), so both listen on one port: UDP takes an ephemeral
  // one and TCP binds the same number, retrying on the rare collision with another TCP socket.
  for (let attempt = 0; ; attempt++) {
    const udp = dns2.createUDPServer(handle);
    await udp.listen(0, '127.0.0.1');
    const { port } = udp.address();
    const tcp = dns2.createTCPServer(handle);
    tcp.listen(port, '127.0.0.1');
    try {
      await once(tcp, 'listening'); // rejects with the 'error' event
    } catch (err) {
      udp.close();
      if ((err as NodeJS.ErrnoException).code === 'EADDRINUSE' && attempt < 20) continue;
      throw err;
    }
    // dns2 keeps TCP connections open between queries (pipelining, 10 s idle timeout); close()
    // ends them so it does not wait for that.
    const connections = new Set<Socket>();
    tcp.on('connection', (socket: Socket) => {
      connections.add(socket);
      socket.once('close', () => connections.delete(socket));
    });

    return {
      address: `127.0.0.1:${port}`,
      port,
      setTxt: (name, values) => void records.set(canonical(name), [...values]),
      setAddresses: (name, addresses) => void addressRecords.set(canonical(name), [...addresses]),
      clear: (name) => {
        records.delete(canonical(name));
        addressRecords.delete(canonical(name));
      },
      queries: () => [...asked],
      close: async () => {
        await Promise.all([
          new Promise<void>((resolve) => udp.close(() => resolve())),
          new Promise<void>((resolve) => {
            tcp.close(() => resolve());
            for (const socket of connections) socket.destroy();
          }),
        ]);
      },
    };
  }
}
