#!/bin/sh
# CTest's entry to the chat page's browser test (chat_page.mjs): skips (77)
# without Node.js; the script itself skips without chromium or chromedriver.
command -v node >/dev/null 2>&1 || { echo "test_webui_browser: skipped: no node"; exit 77; }
exec node "${0%/*}/chat_page.mjs"
