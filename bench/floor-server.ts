/**
 * The independent harness's floor: what the same machine, load generator and framework give a
 * token endpoint that does nothing but the unavoidable. Fastify 5 with orgauth's form parser, one
 * route `POST /oauth/token` that compares the HTTP Basic header with one fixed value, builds the
 * claims of an RFC 9068 access token and signs them ES256 on orgauth's JWS signing thread
 * (src/oauth/helpers/jws.ts, the same path orgauth's tokens take), and answers orgauth's JSON with
 * `Cache-Control: no-store`. No client lookup, no organization, no scopes, no hooks, no logging.
 *
 * Not a server anyone should run: it exists so that the harness's row can say how close to this
 * floor orgauth is, and whether the peer ratio the issue asks for is within reach of Node.js's
 * HTTP stack on the machine at hand. Run by bench/run.ts with FLOOR_PORT and FLOOR_BASIC (the
 * Authorization header it accepts); prints "floor ready" when it listens.
 */
import { generateKeyPairSync, randomUUID } from 'node:crypto';
import Fastify from 'fastify';
import { signJwsInput } from '../src/oauth/helpers/jws.js';

const port = Number(process.env.FLOOR_PORT);
const accepted = process.env.FLOOR_BASIC ?? '';
const issuer = `http://127.0.0.1:${port}`;
const FORM = 'application/x-www-form-urlencoded';

const { privateKey } = generateKeyPairSync('ec', { namedCurve: 'P-256' });
const header = Buffer.from(JSON.stringify({ alg: 'ES256', kid: 'floor', typ: 'at+jwt' })).toString('base64url');

const app = Fastify({ logger: false });
app.removeAllContentTypeParsers();
app.addContentTypeParser(FORM, { parseAs: 'string' }, (_req, body, done) => done(null, new URLSearchParams(String(body))));

app.get('/healthz', async () => ({ status: 'ok' }));
app.post('/oauth/token', async (req, reply) => {
  if (req.headers.authorization !== accepted) return reply.code(401).send({ error: 'invalid_client' });
  const form = req.body as URLSearchParams;
  const scope = form.get('scope') ?? '';
  const now = Math.floor(Date.now() / 1000);
  const claims = { iss: issuer, aud: `${issuer}/api/v1`, sub: 'floor', client_id: 'floor', scope, organization_id: Number(form.get('organization_id')), jti: randomUUID(), iat: now, exp: now + 3600 };
  const input = `${header}.${Buffer.from(JSON.stringify(claims)).toString('base64url')}`;
  const token = `${input}.${await signJwsInput('ES256', input, privateKey)}`;
  reply.header('cache-control', 'no-store').header('pragma', 'no-cache');
  return { token_type: 'Bearer', expires_in: 3600, access_token: token, scope, organization_id: claims.organization_id, organization_name: 'Floor' };
});

process.on('SIGTERM', () => void app.close().then(() => process.exit(0)));
await app.listen({ host: '127.0.0.1', port });
process.stdout.write('floor ready\n');
