/**
 * Runs the example resource server from the environment:
 *
 *   ORGAUTH_ISSUER=http://localhost:3000 npx tsx examples/resource-server/main.ts
 *
 * ORGAUTH_ISSUER        orgauth's issuer (its ISSUER setting), required
 * PORT                  where to listen, default 3002
 * HOST                  the address to listen on, default 127.0.0.1
 * RESOURCE_URI          this service's URI as registered with `orgauth resource create`,
 *                       default http://localhost:$PORT
 * RESOURCE_CLIENT_ID,   its credentials (printed by `orgauth resource create`): set both to check
 * RESOURCE_CLIENT_SECRET  tokens by introspection; unset, tokens are checked offline (JWKS)
 */
import { startResourceServer } from './server.js';

const issuer = process.env.ORGAUTH_ISSUER;
if (!issuer) {
  console.error('Set ORGAUTH_ISSUER to orgauth’s issuer, e.g. ORGAUTH_ISSUER=http://localhost:3000');
  process.exit(2);
}
const port = Number(process.env.PORT ?? '3002');
if (!Number.isInteger(port) || port < 1 || port > 65535) {
  console.error(`PORT must be a port number, not ${process.env.PORT}`);
  process.exit(2);
}
const { RESOURCE_CLIENT_ID: clientId, RESOURCE_CLIENT_SECRET: clientSecret } = process.env;
const mode = clientId && clientSecret ? { kind: 'introspection' as const, clientId, clientSecret } : { kind: 'jwt' as const };

const server = await startResourceServer({
  issuer: issuer.replace(/\/$/, ''),
  resourceUri: process.env.RESOURCE_URI ?? `http://localhost:${port}`,
  port,
  host: process.env.HOST ?? '127.0.0.1',
  mode,
  orders: {},
});
console.log(`resource server at ${server.url}, checking tokens by ${mode.kind === 'jwt' ? 'orgauth’s keys (JWKS)' : 'introspection'}`);

for (const signal of ['SIGINT', 'SIGTERM'] as const) {
  process.once(signal, () => {
    void server.close().then(() => process.exit(0));
  });
}
