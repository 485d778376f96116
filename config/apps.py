"""The operator console's app: ``django.contrib.admin`` serving Tollgate's site (``config.admin_site``).

Apart from the site so that loading the app registry imports nothing that needs the models. Django
imports the site once the apps are ready; the site itself imports no app (its login throttle is
named by ``CONSOLE_LOGIN_THROTTLE``, its index figures registered by the apps).
"""

from django.contrib.admin.apps import AdminConfig


class TollgateAdminConfig(AdminConfig):
    default_site = "config.admin_site.TollgateAdminSite"
