"""Console pages, mounted at /t/<tenant>/skills/. Parameters: `tenant` (slug), `skill_id`; what each names is
declared here for `tenant_view`."""
from django.urls import path

from audit.pages import TargetLink, register_target_links
from skills import views
from skills.models import Skill
from tenancy.web import register_url_objects

app_name = "skills"

register_url_objects({"skill_id": (Skill, "skill")})
register_target_links({"skill": TargetLink(Skill, "pk", "skills:skill_detail", "skill_id")})

urlpatterns = [
    path("", views.skill_list, name="skill_list"),
    path("<int:skill_id>/", views.skill_detail, name="skill_detail"),
    path("<int:skill_id>/exposure/", views.skill_exposure, name="skill_exposure"),
    path("<int:skill_id>/groups/", views.skill_groups, name="skill_groups"),
]
