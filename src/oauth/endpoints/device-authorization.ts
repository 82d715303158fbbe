/**
 * POST /oauth/device_authorization (RFC 8628 §3.1, §3.2): a device without a browser (a CLI, an
 * agent) asks for authorization and gets a device code to poll the token endpoint with, and a
 * user code for a person to enter at /device, where they sign in, choose the organization and
 * decide (src/web/device-pages.ts).
 *
 * What the token endpoint does for every request, this does too (helpers/form-endpoint.ts): form
 * bodies only, no-store, repeated parameters refused, the client authenticated (a public client
 * without a secret by its client_id alone). Only public clients registered for the device grant
 * may use it: a private application acts for its organization, never for a person.
 */
import type { FastifyInstance } from 'fastify';
import { DEVICE_CODE_GRANT } from '../../db/schema.js';
import { UnauthorizedClientError } from '../errors.js';
import { authenticatedForm, type OAuthEndpointOptions, registerFormEndpoint } from '../helpers/form-endpoint.js';
import { splitIdentityScopes } from '../helpers/scopes.js';
import { createDeviceAuthorization, formatUserCode } from '../models/device-authorizations.js';
import { resourceScopes } from '../models/resources.js';

export const DEVICE_AUTHORIZATION_PATH = '/oauth/device_authorization';
/** Where a person enters the user code (RFC 8628 §3.2 verification_uri). */
export const DEVICE_PAGE_PATH = '/device';

/** RFC 8628 §3.2: the device authorization response. */
export interface DeviceAuthorizationResponse {
  device_code: string;
  user_code: string;
  verification_uri: string;
  verification_uri_complete: string;
  expires_in: number;
  interval: number;
}

export async function deviceAuthorizationEndpoint(app: FastifyInstance, options: OAuthEndpointOptions): Promise<void> {
  const { db, config, resources } = options;
  await registerFormEndpoint(app, DEVICE_AUTHORIZATION_PATH, async (req): Promise<DeviceAuthorizationResponse> => {
    const { body, client } = await authenticatedForm(req, options);
    const { application } = client;
    if (application.type !== 'public' || !application.grant_types.includes(DEVICE_CODE_GRANT)) {
      throw new UnauthorizedClientError('this client is not registered for the device authorization grant');
    }
    // RFC 8707: unknown → invalid_target; none named → orgauth's API.
    const resource = await resources.resolve(body.resource);
    // RFC 8628 §3.1: scope is optional; without it, everything the client may have of the resource.
    // The OpenID scopes apart, as at /oauth/authorize; signing in alone delegates no data.
    const { identity, rest } = splitIdentityScopes(body.scope ?? '');
    const scopes = rest === '' && identity.length > 0 ? [] : resourceScopes(rest === '' ? undefined : rest, resource, application);
    const { deviceCode, userCode } = await createDeviceAuthorization(db, {
      applicationId: application.id,
      resourceId: resource.id,
      scopes,
      identityScopes: identity,
      ttlSeconds: config.deviceCodeTtl,
      intervalSeconds: config.devicePollInterval,
    });
    const shown = formatUserCode(userCode);
    const verificationUri = `${config.issuer}${DEVICE_PAGE_PATH}`;
    req.log.info({ client_id: application.client_id }, 'device authorization started');
    return {
      device_code: deviceCode,
      user_code: shown,
      verification_uri: verificationUri,
      verification_uri_complete: `${verificationUri}?${new URLSearchParams({ user_code: shown }).toString()}`,
      expires_in: config.deviceCodeTtl,
      interval: config.devicePollInterval,
    };
  });
}
