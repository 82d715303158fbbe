/*
 * Passkeys on orgauth's pages. Served as /assets/passkeys.js after /assets/webauthn.js
 * (@simplewebauthn/browser, the global SimpleWebAuthnBrowser); the CSP allows no inline script.
 *
 * A container with data-options-url, data-verify-url, data-csrf (and data-return-to) holds
 * buttons with data-passkey-action="register" or "authenticate", an optional passkey_name and
 * current_password field, and an element with role="alert" data-passkey-error for errors. A
 * ceremony is: POST the options URL (JSON), hand the options to the browser, POST its answer to
 * the verify URL, and go where the server says ({ redirect }) — after showing the recovery codes
 * a first passkey comes with ({ recovery_codes }), once, until the user says they saved them.
 *
 * A container with data-passkey-autofill (the login page) also offers passkeys in the email
 * field's autofill (conditional mediation), where the browser supports it.
 */
(function () {
  'use strict';
  var lib = window.SimpleWebAuthnBrowser;

  function showError(container, message) {
    var alert = container.querySelector('[data-passkey-error]');
    if (!alert) return;
    alert.textContent = message;
    alert.hidden = !message;
  }

  function field(container, name) {
    var input = container.querySelector('[name="' + name + '"]');
    return input && input.value !== '' ? input.value : undefined;
  }

  async function post(container, url, body) {
    var res = await fetch(url, {
      method: 'POST',
      credentials: 'same-origin',
      headers: { 'content-type': 'application/json', accept: 'application/json', 'x-csrf-token': container.dataset.csrf || '' },
      body: JSON.stringify(body),
    });
    var data = {};
    try {
      data = await res.json();
    } catch (e) {
      // Not JSON: the message below says what to do.
    }
    if (!res.ok) throw new Error(data.error_description || 'Something went wrong (' + res.status + '). Reload the page and try again.');
    return data;
  }

  /** One ceremony; `autofill`: offered in the email field's autofill rather than asked now. */
  async function ceremony(container, action, autofill) {
    var common = {};
    var returnTo = container.dataset.returnTo;
    var password = field(container, 'current_password');
    if (returnTo) common.return_to = returnTo;
    if (password !== undefined) common.current_password = password;
    var optionsJSON = await post(container, container.dataset.optionsUrl, common);
    var response =
      action === 'register'
        ? await lib.startRegistration({ optionsJSON: optionsJSON })
        : await lib.startAuthentication({ optionsJSON: optionsJSON, useBrowserAutofill: autofill });
    var body = Object.assign({ response: response }, common);
    if (action === 'register') body.name = field(container, 'passkey_name') || 'Passkey';
    var done = await post(container, container.dataset.verifyUrl, body);
    if (Array.isArray(done.recovery_codes) && done.recovery_codes.length > 0) showRecoveryCodes(container, done.recovery_codes, done.redirect);
    else window.location.assign(done.redirect);
  }

  /** The codes in place of the container's controls, and a link on: nothing else shows them again. */
  function showRecoveryCodes(container, codes, redirect) {
    var box = document.createElement('div');
    box.className = 'secret';
    box.setAttribute('role', 'status');
    var intro = document.createElement('p');
    var strong = document.createElement('strong');
    strong.textContent = 'Your passkey was added. Your recovery codes:';
    intro.appendChild(strong);
    intro.appendChild(document.createTextNode(' each signs you in once if you lose your passkeys. Save them somewhere safe now: they are not shown again.'));
    var list = document.createElement('ul');
    list.className = 'codes';
    codes.forEach(function (code) {
      var item = document.createElement('li');
      var text = document.createElement('code');
      text.textContent = code;
      item.appendChild(text);
      list.appendChild(item);
    });
    var next = document.createElement('a');
    next.className = 'button secondary';
    next.href = redirect;
    next.textContent = 'I saved them: continue';
    box.appendChild(intro);
    box.appendChild(list);
    box.appendChild(next);
    container.replaceChildren(box);
  }

  /** The user closed the prompt, or another ceremony replaced this one: nothing to say. */
  function cancelled(err) {
    return err && (err.name === 'AbortError' || err.code === 'ERROR_CEREMONY_ABORTED');
  }

  function describe(err) {
    if (err && err.name === 'NotAllowedError') return 'The passkey prompt was closed or timed out. Try again.';
    if (err && err.code === 'ERROR_AUTHENTICATOR_PREVIOUSLY_REGISTERED') return 'This device has a passkey for your account already.';
    return (err && err.message) || 'The passkey did not work. Try again.';
  }

  document.querySelectorAll('[data-passkey-action]').forEach(function (button) {
    var container = button.closest('[data-options-url]');
    if (!container) return;
    button.addEventListener('click', function () {
      if (!lib || !lib.browserSupportsWebAuthn()) {
        showError(container, 'This browser does not support passkeys.');
        return;
      }
      showError(container, '');
      button.disabled = true;
      ceremony(container, button.dataset.passkeyAction, false).catch(function (err) {
        button.disabled = false;
        if (!cancelled(err)) showError(container, describe(err));
      });
    });
  });

  document.querySelectorAll('[data-passkey-autofill][data-options-url]').forEach(function (container) {
    if (!lib || !lib.browserSupportsWebAuthn()) return;
    lib.browserSupportsWebAuthnAutofill().then(function (supported) {
      if (!supported) return;
      ceremony(container, 'authenticate', true).catch(function (err) {
        // Clicking the button aborts the autofill request: not an error to show.
        if (!cancelled(err)) showError(container, describe(err));
      });
    });
  });
})();
