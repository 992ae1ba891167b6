// The admin's navigation side bar starts closed (issue 31.6): open, it took 280 px of a
// 1366 px screen, and a list beside its filter hid its last columns (the processes list).
// Its « button opens it; Django's nav_sidebar.js (deferred, so it runs after this) then
// remembers the person's choice under the same key.
'use strict';
try {
    if (window.localStorage.getItem('django.admin.navSidebarIsOpen') === null) {
        window.localStorage.setItem('django.admin.navSidebarIsOpen', 'false');
    }
} catch (error) {
    // No storage (private mode, blocked): Django's script then opens the side bar as before.
}
