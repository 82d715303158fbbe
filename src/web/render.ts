/**
 * HTML pages (login, signup, consent, dashboard, error pages): one template engine that escapes
 * every interpolation by default, and the security headers every page carries (AZ-7).
 *
 * Templates live in src/web/views next to this module and are copied to dist/src/web/views by
 * the build, so the folder resolved from import.meta.url works under vitest and from dist/.
 */
import { readFileSync } from 'node:fs';
import { createRequire } from 'node:module';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import helmet from '@fastify/helmet';
import { Eta } from 'eta';
import type { FastifyError, FastifyInstance, FastifyReply } from 'fastify';
import type { Config } from '../config.js';
import { isDatabaseUnavailable } from '../db/errors.js';
import { AppError } from '../errors.js';

export { ForbiddenError } from '../errors.js';

const VIEWS_DIR = fileURLToPath(new URL('./views/', import.meta.url));

/**
 * The files pages load, all from this origin (the CSP allows nothing else): read once at start.
 * webauthn.js is @simplewebauthn/browser's UMD bundle (the global SimpleWebAuthnBrowser),
 * straight from node_modules (a production dependency); passkeys.js is ours and uses it.
 */
const WEBAUTHN_BUNDLE = path.join(path.dirname(createRequire(import.meta.url).resolve('@simplewebauthn/browser')), '..', 'dist', 'bundle', 'index.umd.min.js');
const ASSETS: Record<string, { type: string; body: string }> = {
  '/assets/style.css': { type: 'text/css; charset=utf-8', body: readFileSync(new URL('./assets/style.css', import.meta.url), 'utf8') },
  '/assets/webauthn.js': { type: 'text/javascript; charset=utf-8', body: readFileSync(WEBAUTHN_BUNDLE, 'utf8') },
  '/assets/passkeys.js': { type: 'text/javascript; charset=utf-8', body: readFileSync(new URL('./assets/passkeys.js', import.meta.url), 'utf8') },
};

// autoEscape: `<%= %>` XML-escapes (& < > " '), so user- and client-supplied text is inert.
const eta = new Eta({ views: VIEWS_DIR, autoEscape: true, cache: true });

export function renderPage(reply: FastifyReply, status: number, view: string, data: Record<string, unknown>): FastifyReply {
  return reply.code(status).type('text/html; charset=utf-8').send(eta.render(view, data));
}

/** The plain error page: a title and one sentence, never a redirect (AZ-2). */
export function renderError(reply: FastifyReply, status: number, message: string): FastifyReply {
  return renderPage(reply, status, 'error', { title: status >= 500 ? 'Something went wrong' : 'Request refused', message });
}

/**
 * Call first inside an encapsulated plugin that serves pages: its routes (and only its routes)
 * get the security headers, no-store, and HTML error pages instead of JSON errors.
 */
export async function setUpPages(app: FastifyInstance, config: Config): Promise<void> {
  await app.register(helmet, {
    contentSecurityPolicy: {
      useDefaults: false,
      directives: {
        defaultSrc: ["'self'"],
        baseUri: ["'none'"],
        objectSrc: ["'none'"],
        // Our own scripts only (the passkey ceremonies): no inline script, no other origin.
        scriptSrc: ["'self'"],
        styleSrc: ["'self'"],
        imgSrc: ["'self'"],
        // RFC 9700 §4.16: no page of ours may be framed (clickjacking on login and consent).
        frameAncestors: ["'none'"],
        // No form-action: the consent POST answers 303 to the client's redirect_uri, and browsers
        // apply form-action to that redirect too, which would block the authorization response.
      },
    },
    frameguard: { action: 'deny' },
    referrerPolicy: { policy: 'no-referrer' },
    // HSTS only means something over https.
    strictTransportSecurity: config.issuer.startsWith('https:') ? { maxAge: 31_536_000 } : false,
  });
  app.addHook('onSend', async (_req, reply, payload) => {
    reply.header('cache-control', 'no-store').header('pragma', 'no-cache');
    return payload;
  });
  app.setErrorHandler((err: FastifyError | Error, req, reply) => {
    if (err instanceof AppError) {
      req.log.info({ err: { type: err.name, message: err.message } }, 'request refused');
      return renderError(reply.headers(err.headers), err.statusCode, err.description);
    }
    if (isDatabaseUnavailable(err)) {
      req.log.warn({ err }, 'database unavailable');
      return renderError(reply.header('retry-after', '1'), 503, 'The service is temporarily unavailable. Please try again shortly.');
    }
    const status = 'statusCode' in err ? err.statusCode : undefined;
    if (typeof status === 'number' && status >= 400 && status < 500) return renderError(reply, status, 'The request could not be processed.');
    req.log.error({ err }, 'unhandled error');
    return renderError(reply, 500, 'An unexpected error occurred.');
  });
}

/** GET /assets/*: the stylesheet and the passkey scripts the pages use (CSP allows only this origin). */
export async function pageAssets(app: FastifyInstance): Promise<void> {
  for (const [url, asset] of Object.entries(ASSETS)) {
    app.get(url, async (_req, reply) => reply.type(asset.type).header('cache-control', 'public, max-age=3600').header('x-content-type-options', 'nosniff').send(asset.body));
  }
}
