// The console's one-time secret page: copy the secret to the clipboard (no inline script).
document.addEventListener("DOMContentLoaded", function () {
  var button = document.getElementById("copy-secret");
  var secret = document.getElementById("api-key-secret");
  if (!button || !secret) return;
  button.addEventListener("click", function () {
    var text = secret.textContent.trim();
    var done = function () { button.textContent = "Copied"; };
    if (navigator.clipboard && window.isSecureContext) {
      navigator.clipboard.writeText(text).then(done);
    } else {
      var range = document.createRange();
      range.selectNodeContents(secret);
      var selection = window.getSelection();
      selection.removeAllRanges();
      selection.addRange(range);
      document.execCommand("copy");
      done();
    }
  });
});
