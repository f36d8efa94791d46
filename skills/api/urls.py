"""Include in the API v1 URL list: `path("", include("skills.api.urls"))`."""
from rest_framework.routers import SimpleRouter

from skills.api import views

router = SimpleRouter(trailing_slash=False)
router.register("skills", views.SkillViewSet, basename="skill")

urlpatterns = [*router.urls]
