"""The operator console's app: ``django.contrib.admin`` serving Tollgate's site (``config.admin_site``).

Apart from the site so that loading the app registry imports nothing that needs the models: the
site throttles logins through the rate limiter, whose authentication reads billing's keys. Django
imports the site once the apps are ready.
"""

from django.contrib.admin.apps import AdminConfig


class TollgateAdminConfig(AdminConfig):
    default_site = "config.admin_site.TollgateAdminSite"
