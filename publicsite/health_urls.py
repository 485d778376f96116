"""The liveness route alone: the root URLconf includes it early, before the console and the API's
less busy routes, as a probe polls it often."""

from django.urls import path

from publicsite import site

urlpatterns = [path("health", site.liveness, name="health")]
