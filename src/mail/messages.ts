/**
 * The messages orgauth sends: a subject and text and HTML bodies, from the templates in
 * src/mail/views (copied to dist/src/mail/views by the build; the HTML escaped as pages are).
 * Every value that comes from a user (names, addresses, organization names) goes through the
 * templates, never into markup by hand.
 */
import { fileURLToPath } from 'node:url';
import { Eta } from 'eta';

const VIEWS_DIR = fileURLToPath(new URL('./views/', import.meta.url));
// autoEscape: `<%= %>` XML-escapes (& < > " '), so names and addresses are inert in the HTML part.
const html = new Eta({ views: VIEWS_DIR, autoEscape: true, cache: true });
/** The same views with nothing escaped: for the plain-text part only, never for HTML. */
const text = new Eta({ views: VIEWS_DIR, autoEscape: false, cache: true });

export interface MailMessage {
  to: string;
  subject: string;
  text: string;
  html: string;
}

/** A header value: one line, no control characters (whatever a name or organization holds). */
function headerText(value: string, max = 200): string {
  const line = value.replace(/[\u0000-\u001f\u007f]+/g, ' ').trim();
  return line.length > max ? `${line.slice(0, max - 1)}…` : line;
}

function compose(view: string, to: string, subject: string, data: Record<string, unknown>): MailMessage {
  const values = { ...data, subject };
  return { to, subject: headerText(subject), text: text.render(`${view}-text`, values), html: html.render(`${view}-html`, values) };
}

export function verifyEmailMessage(input: { issuer: string; to: string; name: string; link: string; hours: number; change: boolean }): MailMessage {
  const subject = input.change ? 'Confirm your new email address' : 'Confirm your email address';
  return compose('verify-email', input.to, subject, { ...input, email: input.to });
}

/** The link that creates a pending sign-up's account (src/accounts/sign-ups.ts). */
export function signUpConfirmMessage(input: { issuer: string; to: string; name: string; organizationName: string; link: string; minutes: number }): MailMessage {
  return compose('sign-up-confirm', input.to, 'Finish creating your account', { ...input, email: input.to });
}

/** To the owner of an address someone tried to sign up with: where to sign in, or reset the password. No link that changes anything. */
export function signUpTakenMessage(input: { issuer: string; to: string; name: string }): MailMessage {
  return compose('sign-up-taken', input.to, 'Someone tried to sign up with your email address', {
    ...input,
    email: input.to,
    loginLink: `${input.issuer}/login?${new URLSearchParams({ login_hint: input.to }).toString()}`,
    forgotLink: `${input.issuer}/forgot-password`,
  });
}

export function resetPasswordMessage(input: { issuer: string; to: string; name: string; link: string; minutes: number }): MailMessage {
  return compose('reset-password', input.to, 'Reset your password', { ...input, email: input.to });
}

/** In place of a reset link, for an address whose organization requires its single sign-on: nothing usable. */
export function ssoRequiredMessage(input: { issuer: string; to: string; name: string; organizationName: string; link: string }): MailMessage {
  return compose('sso-required', input.to, 'Sign in with your company account', { ...input, email: input.to });
}

export function emailChangedMessage(input: { issuer: string; to: string; name: string; newEmail: string }): MailMessage {
  return compose('email-changed', input.to, 'Your email address was changed', {
    ...input,
    oldEmail: input.to,
    forgotLink: `${input.issuer}/forgot-password`,
  });
}

export function invitationMessage(input: {
  issuer: string;
  to: string;
  inviter: string;
  organizationName: string;
  role: string;
  link: string;
  expiresAt: Date;
}): MailMessage {
  return compose('invitation', input.to, `You are invited to join ${input.organizationName}`, {
    ...input,
    email: input.to,
    expires: `${input.expiresAt.toISOString().slice(0, 16).replace('T', ' ')} UTC`,
  });
}

/** A change to how the account signs in (a factor added or removed, a recovery code used, the second step locked). */
export function securityNoticeMessage(input: { issuer: string; to: string; name: string; subject: string; what: string; at: Date }): MailMessage {
  return compose('security-notice', input.to, input.subject, {
    ...input,
    email: input.to,
    when: `${input.at.toISOString().slice(0, 16).replace('T', ' ')} UTC`,
    forgotLink: `${input.issuer}/forgot-password`,
  });
}

/** To each owner of an organization whose webhook endpoint was disabled after failing for days (src/webhooks/dispatcher.ts). */
export function webhookDisabledMessage(input: { issuer: string; to: string; name: string; organizationName: string; url: string; failingSince: Date }): MailMessage {
  return compose('webhook-disabled', input.to, `A webhook endpoint of ${input.organizationName} was disabled`, {
    ...input,
    email: input.to,
    since: `${input.failingSince.toISOString().slice(0, 16).replace('T', ' ')} UTC`,
    link: `${input.issuer}/dashboard/webhooks`,
  });
}
