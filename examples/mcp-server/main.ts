/**
 * Runs the example MCP server from the environment:
 *
 *   ORGAUTH_ISSUER=http://localhost:3000 npx tsx examples/mcp-server/main.ts
 *
 * ORGAUTH_ISSUER  orgauth's issuer (its ISSUER setting), required
 * PORT            where to listen, default 3001
 * HOST            the address to listen on, default 127.0.0.1
 * MCP_RESOURCE_URI  this server's URI as clients reach it and as registered with
 *                 `orgauth resource create`, default http://localhost:$PORT/mcp
 */
import { startMcpServer } from './server.js';

const issuer = process.env.ORGAUTH_ISSUER;
if (!issuer) {
  console.error('Set ORGAUTH_ISSUER to orgauth’s issuer, e.g. ORGAUTH_ISSUER=http://localhost:3000');
  process.exit(2);
}
const port = Number(process.env.PORT ?? '3001');
if (!Number.isInteger(port) || port < 1 || port > 65535) {
  console.error(`PORT must be a port number, not ${process.env.PORT}`);
  process.exit(2);
}

const server = await startMcpServer({
  issuer: issuer.replace(/\/$/, ''),
  resourceUri: process.env.MCP_RESOURCE_URI ?? `http://localhost:${port}/mcp`,
  port,
  host: process.env.HOST ?? '127.0.0.1',
});
console.log(`MCP server for ${server.resource} (tokens from ${issuer}); its metadata: ${server.resourceMetadataUrl}`);

for (const signal of ['SIGINT', 'SIGTERM'] as const) {
  process.once(signal, () => {
    void server.close().then(() => process.exit(0));
  });
}
